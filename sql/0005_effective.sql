-- 0005: application profiles. A dispatched job stores the effective values it runs with (its own
-- values merged with its profile and queue, as JSON, with the profile's hash), so a changed profile
-- never reaches a job already dispatched, not even across a controller restart. A dispatch the
-- controller declines (the profile changed since the scheduler's decision) is recorded as an event.
ALTER TABLE jobs ADD COLUMN effective TEXT CHECK (effective IS NULL OR json_valid(effective));

INSERT INTO event_kinds (kind) VALUES ('dispatch_declined');
