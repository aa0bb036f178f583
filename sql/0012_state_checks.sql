-- 0012: the jobs table's state rules, written as `=` / `<>` chains instead of `state IN (...)`.
-- The same rules (state is NOT NULL, so `state NOT IN (a, b)` is `state <> a AND state <> b`;
-- tests/store/test_store_checks.py tries every combination the rules judge against a 0011 table),
-- at ~a third of the CPU per row written: SQLite builds a lookup table for an IN list of more than
-- two values each time a statement runs, and an INSERT or UPDATE of one row is one run
-- (bench/check_cost.py). Every job written and every state change the controller makes pays it.
--
-- SQLite cannot change a CHECK in place, so the table is rebuilt by its documented procedure
-- (https://www.sqlite.org/lang_altertable.html#otheralter): new table, rows copied unchanged (same
-- columns in the same order, ids kept), old table dropped, new one renamed, its indexes made again
-- with the same names and definitions. The migration runner (store/db.py) runs this in one
-- transaction with foreign keys off (the DROP would otherwise delete every row first, against
-- events and flow_steps) and checks them all (`PRAGMA foreign_key_check`) before it commits.
-- The trigger events_no_delete (on events) reads jobs in its body: SQLite refuses the rename while
-- it names a missing table, so it is dropped first and made again as 0009 made it, same text. Not `PRAGMA writable_schema`: a faster edit of the schema text, but one typo and the file
-- no longer opens, and no row would be checked against the new rules.

CREATE TABLE jobs_v12 (
    id          INTEGER PRIMARY KEY,
    user        TEXT    NOT NULL,
    queue       TEXT    NOT NULL,
    state       TEXT    NOT NULL
                CHECK (state = 'PEND' OR state = 'PSUSP' OR state = 'DISP' OR state = 'RUN' OR state = 'USUSP'
                       OR state = 'SSUSP' OR state = 'DONE' OR state = 'EXIT'),
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
    alloc       TEXT    CHECK (alloc IS NULL OR json_valid(alloc)),
    effective   TEXT    CHECK (effective IS NULL OR json_valid(effective)),
    array_id    INTEGER REFERENCES arrays (id),
    array_index INTEGER CHECK (array_index IS NULL OR array_index >= 1),
    name        TEXT,
    depend      TEXT    CHECK (depend IS NULL OR json_valid(depend)),
    retries     INTEGER NOT NULL DEFAULT 0 CHECK (retries >= 0),
    project     TEXT,
    -- a job that holds resources on hosts knows where, and under which unit name
    CHECK ((state <> 'DISP' AND state <> 'RUN' AND state <> 'USUSP' AND state <> 'SSUSP')
           OR (hosts IS NOT NULL AND unit IS NOT NULL)),
    CHECK ((state <> 'RUN' AND state <> 'USUSP' AND state <> 'SSUSP') OR start_time IS NOT NULL),
    -- a finished job has an end, and DONE means exit code 0
    CHECK ((state <> 'DONE' AND state <> 'EXIT') OR end_time IS NOT NULL),
    CHECK (state <> 'DONE' OR exit_code IS 0)
) STRICT;

INSERT INTO jobs_v12 (id, user, queue, state, spec, slots, submit_time, attempt, hosts, unit, start_time, end_time,
                      exit_code, exit_signal, cpu_time, max_rss, reason, pend_reason, alloc, effective, array_id,
                      array_index, name, depend, retries, project)
    SELECT id, user, queue, state, spec, slots, submit_time, attempt, hosts, unit, start_time, end_time,
           exit_code, exit_signal, cpu_time, max_rss, reason, pend_reason, alloc, effective, array_id,
           array_index, name, depend, retries, project
    FROM jobs ORDER BY id;
DROP TRIGGER events_no_delete;
DROP TABLE jobs;
ALTER TABLE jobs_v12 RENAME TO jobs;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
WHEN NOT EXISTS (SELECT 1 FROM events_archive a WHERE a.job_id = OLD.job_id AND a.seq = OLD.seq)
  OR NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = OLD.job_id AND j.state IN ('DONE', 'EXIT'))
BEGIN SELECT RAISE(ABORT, 'events are append-only (only an archived finished job''s events may leave)'); END;

-- the indexes as 0001, 0006, 0009 and 0010 made them (a partial index's WHERE is left as it was:
-- the planner uses it only for queries whose WHERE holds that same term)
CREATE INDEX jobs_unfinished ON jobs (state, id) WHERE state NOT IN ('DONE', 'EXIT');
CREATE INDEX jobs_user ON jobs (user, id);
CREATE INDEX jobs_array ON jobs (array_id, array_index) WHERE array_id IS NOT NULL;
CREATE INDEX jobs_user_name ON jobs (user, name, id);
CREATE INDEX jobs_finished_end ON jobs (end_time) WHERE state IN ('DONE', 'EXIT');
CREATE INDEX jobs_project ON jobs (project, id) WHERE project IS NOT NULL;
