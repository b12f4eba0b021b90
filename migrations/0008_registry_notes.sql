-- 0008_registry_notes: what users of a registry expect to see.
--
--   * a description (UTF-8, at most 4096 bytes) and tags (a JSON object of
--     string values: at most 64 keys of 1..64 bytes of [A-Za-z0-9._/-],
--     values of at most 1024 bytes) on models and generations; the C layer
--     (server/registry/notes.c) checks the limits and names the field, the
--     CHECKs here are the backstop for the shapes;
--   * a content hash per tensor (XXH3-128 of its bytes, 32 lower-case hex
--     digits in xxHash's canonical order), computed by the importer while
--     it hashes the shard; NULL for tensors imported before this migration
--     (a diff then compares the shards' SHA-256 instead);
--   * the event log: one row per change, written in the same transaction as
--     the change (who: a token's name, "local uid N", "cli" for the
--     store-direct CLI, or the job's requester for what an import does
--     later; what; before and after as JSON objects). Events name their
--     model by name, not by id, so they outlive a deleted model;
--   * the requester of a job (jobs.actor), so the events a job writes later
--     name who asked for it.

ALTER TABLE models ADD COLUMN description TEXT NOT NULL DEFAULT ''
    CHECK (length(CAST(description AS BLOB)) <= 4096);
ALTER TABLE models ADD COLUMN tags TEXT NOT NULL DEFAULT '{}'
    CHECK (json_valid(tags) AND json_type(tags) = 'object');
ALTER TABLE generations ADD COLUMN description TEXT NOT NULL DEFAULT ''
    CHECK (length(CAST(description AS BLOB)) <= 4096);
ALTER TABLE generations ADD COLUMN tags TEXT NOT NULL DEFAULT '{}'
    CHECK (json_valid(tags) AND json_type(tags) = 'object');

ALTER TABLE tensors ADD COLUMN xxh3 TEXT
    CHECK (xxh3 IS NULL OR (length(xxh3) = 32 AND xxh3 NOT GLOB '*[^0-9a-f]*'));

ALTER TABLE jobs ADD COLUMN actor TEXT;

CREATE TABLE events (
    id         INTEGER PRIMARY KEY,
    time       INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER)),
    actor      TEXT    NOT NULL CHECK (length(actor) > 0),
    action     TEXT    NOT NULL CHECK (length(action) > 0),
    model      TEXT,
    generation INTEGER CHECK (generation IS NULL OR generation > 0),
    before     TEXT    CHECK (before IS NULL OR (json_valid(before) AND json_type(before) = 'object')),
    after      TEXT    CHECK (after IS NULL OR (json_valid(after) AND json_type(after) = 'object'))
) STRICT;
CREATE INDEX events_model ON events (model, id);
