-- 0005_job_resume: a remote import (an http(s):// or s3:// source, or a
-- fleet pull) interrupted by a crash, a kill or a lost network resumes
-- where it stopped. The job row keeps what it reserved
-- and how far each reservation is written and flushed:
--   {"source": S, "generation": N, "objects": [{"shard": NAME,
--    "bytes": FILE_LEN, "sha256": HEX or null, "device": ID,
--    "object": ID, "done": BYTES}, ...]}
-- ('done': every byte of the object below it is on the device and
-- flushed). The next import of the same model from the same source takes
-- the record over (one transaction moves it) and writes only the rest.
--
-- Invariants: 'writing' objects named by a job's resume survive the
-- start-up reclaim; every other 'writing' object is deleted there; a resume
-- record unused for a day is dropped at start-up and its objects reclaimed.

ALTER TABLE jobs ADD COLUMN resume TEXT
    CHECK (resume IS NULL OR (json_valid(resume) AND json_type(resume) = 'object'));
