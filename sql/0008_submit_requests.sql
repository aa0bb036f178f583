-- 0008: idempotent submission. A client sends a request id with each submission; the ids of the
-- jobs it stored are kept under it, written in the same transaction as the jobs. A retry after a
-- lost reply (the controller died, or the connection broke, after the commit) finds the id and is
-- answered with those jobs instead of storing a second copy.
CREATE TABLE submit_requests (
    request_id  TEXT    PRIMARY KEY,
    user        TEXT    NOT NULL,
    job_ids     TEXT    NOT NULL CHECK (json_valid(job_ids) AND json_type(job_ids) = 'array'),
    submit_time REAL    NOT NULL
) STRICT, WITHOUT ROWID;
