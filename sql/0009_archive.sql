-- 0009: retention. Finished jobs older than `controller.keep_finished` leave the live tables for
-- an archive in this same file that `xce hist` and `xce acct` still read, in bounded batches
-- (store/archive.py). The archive keeps what accounting needs, not the spec (whose environment copy
-- is most of a job row): one row per job, its events unchanged (seq included), and usage per day
-- that outlives the per-job rows (`controller.keep_archived`), which fair share reads.

CREATE TABLE jobs_archive (
    id          INTEGER PRIMARY KEY,
    user        TEXT    NOT NULL,
    queue       TEXT    NOT NULL,
    project     TEXT,
    name        TEXT,
    state       TEXT    NOT NULL CHECK (state IN ('DONE', 'EXIT')),
    array_id    INTEGER,
    array_index INTEGER,
    submit_time REAL    NOT NULL,
    start_time  REAL,
    end_time    REAL    NOT NULL,
    exit_code   INTEGER,
    exit_signal INTEGER,
    reason      TEXT,
    slots       INTEGER NOT NULL CHECK (slots >= 1),
    gpus        INTEGER NOT NULL DEFAULT 0 CHECK (gpus >= 0),
    hosts       TEXT    CHECK (hosts IS NULL OR json_valid(hosts)),  -- [[host, tasks], ...]
    cpu_time    REAL,
    max_rss     INTEGER,
    attempt     INTEGER NOT NULL DEFAULT 0,
    retries     INTEGER NOT NULL DEFAULT 0,
    command     TEXT    CHECK (command IS NULL OR json_valid(command)),
    CHECK (state <> 'DONE' OR exit_code IS 0)
) STRICT;
CREATE INDEX jobs_archive_end ON jobs_archive (end_time);
CREATE INDEX jobs_archive_user ON jobs_archive (user, end_time);
CREATE INDEX jobs_archive_array ON jobs_archive (array_id, array_index) WHERE array_id IS NOT NULL;

-- the events of archived jobs, rows copied as they were. A seq orders the events of one job: once
-- the newest events are archived, `events` may hand their numbers out again (SQLite takes max + 1),
-- so here a seq is unique per job only.
CREATE TABLE events_archive (
    job_id  INTEGER NOT NULL,
    seq     INTEGER NOT NULL,
    time    REAL    NOT NULL,
    kind    TEXT    NOT NULL,
    version INTEGER NOT NULL,
    data    TEXT    CHECK (data IS NULL OR json_valid(data)),
    PRIMARY KEY (job_id, seq)
) STRICT, WITHOUT ROWID;

CREATE TRIGGER events_archive_no_update BEFORE UPDATE ON events_archive
BEGIN SELECT RAISE(ABORT, 'archived events are never changed'); END;
-- archived events leave only with their job's archive row (keep_archived), never before it
CREATE TRIGGER events_archive_no_delete BEFORE DELETE ON events_archive
WHEN EXISTS (SELECT 1 FROM jobs_archive a WHERE a.id = OLD.job_id)
BEGIN SELECT RAISE(ABORT, 'archived events leave only after their job''s archive row'); END;

-- The one sanctioned way out of `events`: the event of a FINISHED job whose copy (same seq) is
-- already in events_archive. The events of a live job stay refused, as before.
DROP TRIGGER events_no_delete;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
WHEN NOT EXISTS (SELECT 1 FROM events_archive a WHERE a.job_id = OLD.job_id AND a.seq = OLD.seq)
  OR NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = OLD.job_id AND j.state IN ('DONE', 'EXIT'))
BEGIN SELECT RAISE(ABORT, 'events are append-only (only an archived finished job''s events may leave)'); END;

-- Usage of archived jobs per day they ended (the controller's local time), summed per group of
-- one kind (dim): per user, per project, per queue, per host (the host that ran the command), and
-- per user and queue (key "USER<TAB>QUEUE", for the dashboard's table). A job counts once in each
-- kind; '' is "none" (no project). One kind per row keeps a year of a busy lab to thousands of
-- rows, so `xce acct --by X` reads whole days from here; fair share reads `user` or `project`.
-- w0..w103: how many waits fell in each of accounting.py's log buckets (for the median and p95),
-- as columns so that SQLite sums a year of them per key (a 0 takes no room in a row).
CREATE TABLE usage_daily (
    day        TEXT    NOT NULL,
    dim        TEXT    NOT NULL CHECK (dim IN ('user', 'project', 'queue', 'host', 'user_queue')),
    key        TEXT    NOT NULL,
    jobs       INTEGER NOT NULL,
    done       INTEGER NOT NULL,
    exit       INTEGER NOT NULL,
    started    INTEGER NOT NULL,
    wait_s     REAL    NOT NULL,
    run_s      REAL    NOT NULL,
    cpu_s      REAL    NOT NULL,
    cpu_slot_s REAL    NOT NULL,  -- slot-seconds of the jobs whose cpu time is known (efficiency)
    slot_s     REAL    NOT NULL,
    gpu_s      REAL    NOT NULL,
    max_rss    INTEGER NOT NULL,
    w0 INTEGER NOT NULL DEFAULT 0, w1 INTEGER NOT NULL DEFAULT 0, w2 INTEGER NOT NULL DEFAULT 0, w3 INTEGER NOT NULL DEFAULT 0,
    w4 INTEGER NOT NULL DEFAULT 0, w5 INTEGER NOT NULL DEFAULT 0, w6 INTEGER NOT NULL DEFAULT 0, w7 INTEGER NOT NULL DEFAULT 0,
    w8 INTEGER NOT NULL DEFAULT 0, w9 INTEGER NOT NULL DEFAULT 0, w10 INTEGER NOT NULL DEFAULT 0, w11 INTEGER NOT NULL DEFAULT 0,
    w12 INTEGER NOT NULL DEFAULT 0, w13 INTEGER NOT NULL DEFAULT 0, w14 INTEGER NOT NULL DEFAULT 0, w15 INTEGER NOT NULL DEFAULT 0,
    w16 INTEGER NOT NULL DEFAULT 0, w17 INTEGER NOT NULL DEFAULT 0, w18 INTEGER NOT NULL DEFAULT 0, w19 INTEGER NOT NULL DEFAULT 0,
    w20 INTEGER NOT NULL DEFAULT 0, w21 INTEGER NOT NULL DEFAULT 0, w22 INTEGER NOT NULL DEFAULT 0, w23 INTEGER NOT NULL DEFAULT 0,
    w24 INTEGER NOT NULL DEFAULT 0, w25 INTEGER NOT NULL DEFAULT 0, w26 INTEGER NOT NULL DEFAULT 0, w27 INTEGER NOT NULL DEFAULT 0,
    w28 INTEGER NOT NULL DEFAULT 0, w29 INTEGER NOT NULL DEFAULT 0, w30 INTEGER NOT NULL DEFAULT 0, w31 INTEGER NOT NULL DEFAULT 0,
    w32 INTEGER NOT NULL DEFAULT 0, w33 INTEGER NOT NULL DEFAULT 0, w34 INTEGER NOT NULL DEFAULT 0, w35 INTEGER NOT NULL DEFAULT 0,
    w36 INTEGER NOT NULL DEFAULT 0, w37 INTEGER NOT NULL DEFAULT 0, w38 INTEGER NOT NULL DEFAULT 0, w39 INTEGER NOT NULL DEFAULT 0,
    w40 INTEGER NOT NULL DEFAULT 0, w41 INTEGER NOT NULL DEFAULT 0, w42 INTEGER NOT NULL DEFAULT 0, w43 INTEGER NOT NULL DEFAULT 0,
    w44 INTEGER NOT NULL DEFAULT 0, w45 INTEGER NOT NULL DEFAULT 0, w46 INTEGER NOT NULL DEFAULT 0, w47 INTEGER NOT NULL DEFAULT 0,
    w48 INTEGER NOT NULL DEFAULT 0, w49 INTEGER NOT NULL DEFAULT 0, w50 INTEGER NOT NULL DEFAULT 0, w51 INTEGER NOT NULL DEFAULT 0,
    w52 INTEGER NOT NULL DEFAULT 0, w53 INTEGER NOT NULL DEFAULT 0, w54 INTEGER NOT NULL DEFAULT 0, w55 INTEGER NOT NULL DEFAULT 0,
    w56 INTEGER NOT NULL DEFAULT 0, w57 INTEGER NOT NULL DEFAULT 0, w58 INTEGER NOT NULL DEFAULT 0, w59 INTEGER NOT NULL DEFAULT 0,
    w60 INTEGER NOT NULL DEFAULT 0, w61 INTEGER NOT NULL DEFAULT 0, w62 INTEGER NOT NULL DEFAULT 0, w63 INTEGER NOT NULL DEFAULT 0,
    w64 INTEGER NOT NULL DEFAULT 0, w65 INTEGER NOT NULL DEFAULT 0, w66 INTEGER NOT NULL DEFAULT 0, w67 INTEGER NOT NULL DEFAULT 0,
    w68 INTEGER NOT NULL DEFAULT 0, w69 INTEGER NOT NULL DEFAULT 0, w70 INTEGER NOT NULL DEFAULT 0, w71 INTEGER NOT NULL DEFAULT 0,
    w72 INTEGER NOT NULL DEFAULT 0, w73 INTEGER NOT NULL DEFAULT 0, w74 INTEGER NOT NULL DEFAULT 0, w75 INTEGER NOT NULL DEFAULT 0,
    w76 INTEGER NOT NULL DEFAULT 0, w77 INTEGER NOT NULL DEFAULT 0, w78 INTEGER NOT NULL DEFAULT 0, w79 INTEGER NOT NULL DEFAULT 0,
    w80 INTEGER NOT NULL DEFAULT 0, w81 INTEGER NOT NULL DEFAULT 0, w82 INTEGER NOT NULL DEFAULT 0, w83 INTEGER NOT NULL DEFAULT 0,
    w84 INTEGER NOT NULL DEFAULT 0, w85 INTEGER NOT NULL DEFAULT 0, w86 INTEGER NOT NULL DEFAULT 0, w87 INTEGER NOT NULL DEFAULT 0,
    w88 INTEGER NOT NULL DEFAULT 0, w89 INTEGER NOT NULL DEFAULT 0, w90 INTEGER NOT NULL DEFAULT 0, w91 INTEGER NOT NULL DEFAULT 0,
    w92 INTEGER NOT NULL DEFAULT 0, w93 INTEGER NOT NULL DEFAULT 0, w94 INTEGER NOT NULL DEFAULT 0, w95 INTEGER NOT NULL DEFAULT 0,
    w96 INTEGER NOT NULL DEFAULT 0, w97 INTEGER NOT NULL DEFAULT 0, w98 INTEGER NOT NULL DEFAULT 0, w99 INTEGER NOT NULL DEFAULT 0,
    w100 INTEGER NOT NULL DEFAULT 0, w101 INTEGER NOT NULL DEFAULT 0, w102 INTEGER NOT NULL DEFAULT 0, w103 INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (dim, day, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX jobs_archive_project ON jobs_archive (project, end_time) WHERE project IS NOT NULL;

-- retention's scan: finished jobs by end time; and the steps that name a job (what it asks, and
-- what deleting a job row checks for the foreign key, would otherwise read every step)
CREATE INDEX jobs_finished_end ON jobs (end_time) WHERE state IN ('DONE', 'EXIT');
CREATE INDEX flow_steps_job ON flow_steps (job_id);
