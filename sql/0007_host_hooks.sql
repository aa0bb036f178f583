-- 0007: a job's other hosts end after the job does (their units drain once the first host's unit
-- reports): what their host hooks did then (post_host_exec above all) is an event of its own on
-- the job, `host_hooks`, with the host, each hook run and the note of those that failed.
INSERT INTO event_kinds (kind) VALUES ('host_hooks');
