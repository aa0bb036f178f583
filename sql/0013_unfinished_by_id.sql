-- 0013: the index of unfinished jobs keyed by id alone, instead of (state, id).
-- Keyed by state, a job's entry moved across the index at each step (PEND near the front, DISP
-- before it, RUN at the end), so a tick that dispatches job n and records the start of job n-1
-- rewrote two pages of it, with a backlog of pending jobs between them: two of the commit's ~nine
-- WAL frames (bench/record_tick.py). Keyed by id, those jobs' entries are neighbours: one page.
-- (SQLite still rewrites an entry whose row's state changes: the state is in its condition.)
-- No query searched it by state: with `state NOT IN (?, ?)` bound, SQLite cannot prove a query
-- within a partial index and scans the table. The reads of unfinished jobs (store/job_reads.py,
-- projects.py) now write the condition as literals and scan this index, in id order (the order
-- they return), and archive.py's query reads it as before (tests/store/test_store_unfinished_index.py).
DROP INDEX jobs_unfinished;
CREATE INDEX jobs_unfinished ON jobs (id) WHERE state NOT IN ('DONE', 'EXIT');
