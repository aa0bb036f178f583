-- 0006: workflows: job arrays, dependencies, retries and flows.
--
-- An array is one row here holding the spec its elements share, so that 10,000 elements do not
-- copy the submit environment 10,000 times; each element is a job row of its own (own state,
-- attempts, outcome) whose spec is '{}' and whose array_id names the array. The array's id is its
-- first element's job id, so a job id and an array id never name two different things.
CREATE TABLE arrays (
    id          INTEGER PRIMARY KEY,
    user        TEXT    NOT NULL,
    spec        TEXT    NOT NULL CHECK (json_valid(spec)),
    size        INTEGER NOT NULL CHECK (size >= 1),
    depend      TEXT    CHECK (depend IS NULL OR json_valid(depend)),  -- every element's, resolved
    submit_time REAL    NOT NULL
) STRICT;

ALTER TABLE jobs ADD COLUMN array_id INTEGER REFERENCES arrays (id);
ALTER TABLE jobs ADD COLUMN array_index INTEGER CHECK (array_index IS NULL OR array_index >= 1);
-- the job's name as users see it, for `-w done(name)`: the user's most recent job of that name
ALTER TABLE jobs ADD COLUMN name TEXT;
-- the dependency (-w) resolved to job and array ids (deps.to_json); an element's is its array's
ALTER TABLE jobs ADD COLUMN depend TEXT CHECK (depend IS NULL OR json_valid(depend));
-- how many times the job was requeued to retry after a failure (--retry)
ALTER TABLE jobs ADD COLUMN retries INTEGER NOT NULL DEFAULT 0 CHECK (retries >= 0);

UPDATE jobs SET name = json_extract(spec, '$.name');
CREATE INDEX jobs_array ON jobs (array_id, array_index) WHERE array_id IS NOT NULL;
CREATE INDEX jobs_user_name ON jobs (user, name, id);

-- A flow: the steps of one `xce flow submit` (or rescue), each naming its job or array.
CREATE TABLE flows (
    id          INTEGER PRIMARY KEY,
    name        TEXT    NOT NULL,
    user        TEXT    NOT NULL,
    submit_time REAL    NOT NULL,
    rescue_of   INTEGER REFERENCES flows (id)
) STRICT;
CREATE INDEX flows_user_name ON flows (user, name, id);

CREATE TABLE flow_steps (
    flow_id  INTEGER NOT NULL REFERENCES flows (id),
    position INTEGER NOT NULL,  -- dependency order: upstream steps first
    step     TEXT    NOT NULL,
    job_id   INTEGER NOT NULL REFERENCES jobs (id),  -- the job, or the array's id
    is_array INTEGER NOT NULL CHECK (is_array IN (0, 1)),
    depend   TEXT,  -- the step's condition on step names, as written (after: edges included)
    upstream TEXT   NOT NULL CHECK (json_valid(upstream)),  -- the step names it depends on
    PRIMARY KEY (flow_id, step)
) STRICT;

-- a pending job whose dependency can never be satisfied is cancelled (unless it asked to pend)
INSERT INTO event_kinds (kind) VALUES ('dependency_failed');
