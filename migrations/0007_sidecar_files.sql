-- 0007_sidecar_files: the small non-weight files a generation was imported
-- with (config.json, the tokenizer's files, the model card ...), so that a
-- generation is a whole model (docs/store.md: sidecar files).
--
-- sidecar_blobs holds each content once (by its SHA-256, byte for byte);
-- generation_files names them per generation. Both are written in the
-- transaction that publishes the generation, never changed after, and a
-- generation's rows go with it (ON DELETE CASCADE); gc drops the rows of
-- retired and failed generations no lease holds, then every blob no row
-- names.

CREATE TABLE sidecar_blobs (
    sha256 TEXT PRIMARY KEY CHECK (length(sha256) = 64),
    data   BLOB NOT NULL
) STRICT;

CREATE TABLE generation_files (
    generation_id INTEGER NOT NULL REFERENCES generations (id) ON DELETE CASCADE,
    path          TEXT NOT NULL CHECK (length(path) BETWEEN 1 AND 512),
    len           INTEGER NOT NULL CHECK (len >= 0),
    sha256        TEXT NOT NULL REFERENCES sidecar_blobs (sha256),
    PRIMARY KEY (generation_id, path)
) STRICT;

CREATE INDEX generation_files_sha256 ON generation_files (sha256);

-- Files are added only while the generation is importing.
CREATE TRIGGER generation_files_only_importing
BEFORE INSERT ON generation_files
WHEN NOT EXISTS (SELECT 1 FROM generations g
                 WHERE g.id = NEW.generation_id AND g.state = 'importing')
BEGIN
    SELECT RAISE(ABORT, 'sidecar files are added only to importing generations');
END;

CREATE TRIGGER generation_files_immutable
BEFORE UPDATE ON generation_files
BEGIN
    SELECT RAISE(ABORT, 'sidecar files are immutable');
END;

CREATE TRIGGER sidecar_blobs_immutable
BEFORE UPDATE ON sidecar_blobs
BEGIN
    SELECT RAISE(ABORT, 'sidecar blobs are immutable');
END;
