-- 0003: the event kinds move from a CHECK on events.kind to a table that events refer to, so that
-- a later migration adds a kind with one INSERT (SQLite cannot change a CHECK without rebuilding
-- the table, as this migration does once). Rows are copied unchanged, seq included.

CREATE TABLE event_kinds (
    kind TEXT PRIMARY KEY
) STRICT, WITHOUT ROWID;

INSERT INTO event_kinds (kind) VALUES
    ('submitted'), ('held'), ('released'), ('dispatched'), ('started'), ('launch_failed'),
    ('killed_pending'), ('kill_requested'), ('finished'), ('lost');

CREATE TABLE events_v3 (
    seq     INTEGER PRIMARY KEY,
    job_id  INTEGER NOT NULL REFERENCES jobs (id),
    time    REAL    NOT NULL,
    kind    TEXT    NOT NULL REFERENCES event_kinds (kind),
    version INTEGER NOT NULL DEFAULT 1,
    data    TEXT    CHECK (data IS NULL OR json_valid(data))
) STRICT;
INSERT INTO events_v3 (seq, job_id, time, kind, version, data)
    SELECT seq, job_id, time, kind, version, data FROM events ORDER BY seq;
-- the implicit DELETE of a DROP TABLE fires no trigger; the old triggers go with the table
DROP TABLE events;
ALTER TABLE events_v3 RENAME TO events;
CREATE INDEX events_job ON events (job_id, seq);

CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
