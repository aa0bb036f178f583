-- 0001: jobs, their append-only event history, and the store's own facts.
-- A shipped migration is never edited: later changes go in 0002_*.sql and on.

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

CREATE TABLE jobs (
    id          INTEGER PRIMARY KEY,
    user        TEXT    NOT NULL,
    queue       TEXT    NOT NULL,
    state       TEXT    NOT NULL
                CHECK (state IN ('PEND', 'PSUSP', 'DISP', 'RUN', 'USUSP', 'SSUSP', 'DONE', 'EXIT')),
    spec        TEXT    NOT NULL CHECK (json_valid(spec)),  -- the JobSpec as submitted
    slots       INTEGER NOT NULL CHECK (slots >= 1),
    submit_time REAL    NOT NULL,
    attempt     INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    hosts       TEXT    CHECK (hosts IS NULL OR json_valid(hosts)),  -- [[host, tasks], ...]
    unit        TEXT,
    start_time  REAL,
    end_time    REAL,
    exit_code   INTEGER,
    exit_signal INTEGER,
    cpu_time    REAL,
    max_rss     INTEGER,
    reason      TEXT,
    pend_reason TEXT,
    -- a job that holds resources on hosts knows where, and under which unit name
    CHECK (state NOT IN ('DISP', 'RUN', 'USUSP', 'SSUSP') OR (hosts IS NOT NULL AND unit IS NOT NULL)),
    CHECK (state NOT IN ('RUN', 'USUSP', 'SSUSP') OR start_time IS NOT NULL),
    -- a finished job has an end, and DONE means exit code 0
    CHECK (state NOT IN ('DONE', 'EXIT') OR end_time IS NOT NULL),
    CHECK (state <> 'DONE' OR exit_code IS 0)
) STRICT;

-- the controller's working set: everything not finished
CREATE INDEX jobs_unfinished ON jobs (state, id) WHERE state NOT IN ('DONE', 'EXIT');
CREATE INDEX jobs_user ON jobs (user, id);

-- past tense, append only, versioned: the history `xce jobs -l` and accounting read
CREATE TABLE events (
    seq     INTEGER PRIMARY KEY,
    job_id  INTEGER NOT NULL REFERENCES jobs (id),
    time    REAL    NOT NULL,
    kind    TEXT    NOT NULL CHECK (kind IN ('submitted', 'held', 'released', 'dispatched', 'started',
                                             'launch_failed', 'killed_pending', 'kill_requested',
                                             'finished', 'lost')),
    version INTEGER NOT NULL DEFAULT 1,
    data    TEXT    CHECK (data IS NULL OR json_valid(data))
) STRICT;
CREATE INDEX events_job ON events (job_id, seq);

CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
