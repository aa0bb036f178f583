-- 0002: what a dispatched job holds (resources per host, GPU indices, shared counters), so that
-- a restarted controller knows what is free without asking anybody.
ALTER TABLE jobs ADD COLUMN alloc TEXT CHECK (alloc IS NULL OR json_valid(alloc));
