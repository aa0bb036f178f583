-- 0004: a job may go back to PEND (requeued: its host was lost, or by hand) and be suspended and
-- resumed while it runs (USUSP). A requeued job keeps its attempt number; its next dispatch takes
-- the next one, so the new unit never shares a name with a copy that may still run somewhere.
INSERT INTO event_kinds (kind) VALUES ('requeued'), ('suspended'), ('resumed');
