-- 0011: idempotent flow submission, and pruning of submit requests.
-- A flow submission (`xce flow submit`, `xce flow rescue`) remembers its request id in
-- submit_requests too (job_ids: the jobs it stored), with the reply it got (`reply`, JSON), so a
-- repeat is answered with that reply even once the flow has gone to the archive. A job
-- submission's reply is rebuilt from its ids, as before: its `reply` is NULL. Rows older than
-- `controller.keep_requests` are deleted by the retention step, oldest first: the index below
-- keeps each bounded batch from scanning the whole table.
ALTER TABLE submit_requests ADD COLUMN reply TEXT CHECK (reply IS NULL OR json_valid(reply));
CREATE INDEX submit_requests_time ON submit_requests (submit_time);
