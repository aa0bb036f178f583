-- 0010: projects (issue 17). A job belongs to one project, named by its path (lab/vision): the one
-- it named with -P, else its submitter's group default, else the cluster default, resolved at
-- submit and kept in its spec (`project`). This column mirrors the spec's value for queries
-- (`xce jobs -P`, accounting, fair share by project); jobs stored before it have none (NULL).
ALTER TABLE jobs ADD COLUMN project TEXT;
UPDATE jobs SET project = json_extract(spec, '$.project') WHERE json_extract(spec, '$.project') IS NOT NULL;
CREATE INDEX jobs_project ON jobs (project, id) WHERE project IS NOT NULL;
