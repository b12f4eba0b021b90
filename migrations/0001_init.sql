-- 0001_init: the registry schema (docs/architecture.md: the three mappings, the store).
--
-- Append-only: never edit an applied migration; add NNNN_description.sql.
-- The runner applies each file in its own BEGIN IMMEDIATE transaction and
-- sets PRAGMA user_version to NNNN in the same transaction, so a file must
-- not contain BEGIN/COMMIT.
--
-- Invariants kept by the database itself (the C layer checks them first and
-- reports them with precise errors; these are the backstop):
--   * byte quantities are non-negative INTEGERs (tables are STRICT);
--   * objects are object_align aligned, lie inside their device's data
--     region and never overlap another object on the same device;
--   * a committed object is immutable; (device, sha256) is unique among
--     committed objects, so identical shards are stored once per device;
--   * generation states move only importing -> ready | failed and
--     ready | failed -> retired; a model's active generation exists and is
--     ready, and stays ready while active;
--   * shards and bindings are added only to importing generations (tensors
--     too, checked in C), and a tensor belongs to a shard of its own
--     generation.
-- Timestamps are unix seconds (UTC).

CREATE TABLE devices (
    id           INTEGER PRIMARY KEY,
    uuid         TEXT    NOT NULL UNIQUE
                 CHECK (length(uuid) = 36 AND uuid GLOB
                     '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]'),
    path         TEXT    NOT NULL CHECK (length(path) > 0),
    kind         TEXT    NOT NULL CHECK (kind IN ('file', 'block', 'nvme')),
    lba_size     INTEGER NOT NULL CHECK (lba_size >= 512 AND (lba_size & (lba_size - 1)) = 0),
    io_align     INTEGER NOT NULL
                 CHECK (io_align > 0 AND io_align % lba_size = 0 AND io_align % 4096 = 0),
    object_align INTEGER NOT NULL
                 CHECK (object_align > 0 AND object_align % io_align = 0
                        AND object_align % 65536 = 0),
    size_bytes   INTEGER NOT NULL CHECK (size_bytes > 0),
    region_off   INTEGER NOT NULL CHECK (region_off > 0 AND region_off % io_align = 0),
    region_len   INTEGER NOT NULL
                 CHECK (region_len > 0 AND region_len <= size_bytes - region_off),
    data_off     INTEGER NOT NULL
                 CHECK (data_off > region_off AND data_off % object_align = 0
                        AND data_off - region_off <= region_len),
    identity     TEXT    NOT NULL DEFAULT '{}'
                 CHECK (json_valid(identity) AND json_type(identity) = 'object'),
    created_at   INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER))
) STRICT;

CREATE TABLE objects (
    id            INTEGER PRIMARY KEY,
    device_id     INTEGER NOT NULL REFERENCES devices (id),
    base_off      INTEGER NOT NULL CHECK (base_off > 0),
    alloc_len     INTEGER NOT NULL CHECK (alloc_len > 0),
    canonical_len INTEGER NOT NULL CHECK (canonical_len > 0 AND canonical_len <= alloc_len),
    sha256        TEXT
                  CHECK (sha256 IS NULL OR (length(sha256) = 64
                                            AND sha256 NOT GLOB '*[^0-9a-f]*')),
    state         TEXT    NOT NULL DEFAULT 'writing' CHECK (state IN ('writing', 'committed')),
    created_at    INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER)),
    CHECK (state = 'writing' OR sha256 IS NOT NULL)
) STRICT;
-- One row per extent start; the allocator reads extents in this order.
CREATE UNIQUE INDEX objects_device_extent ON objects (device_id, base_off);
-- Dedup: a committed shard image is stored once per device.
CREATE UNIQUE INDEX objects_device_sha256 ON objects (device_id, sha256)
    WHERE state = 'committed';
CREATE INDEX objects_writing ON objects (state) WHERE state = 'writing';

CREATE TRIGGER objects_extent_insert BEFORE INSERT ON objects
BEGIN
    SELECT RAISE(ABORT, 'object device does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM devices WHERE id = NEW.device_id);
    SELECT RAISE(ABORT, 'object extent is not object_align aligned')
    FROM devices d
    WHERE d.id = NEW.device_id
      AND (NEW.base_off % d.object_align != 0 OR NEW.alloc_len % d.object_align != 0);
    SELECT RAISE(ABORT, 'object extent lies outside the device data region')
    FROM devices d
    WHERE d.id = NEW.device_id
      AND (NEW.base_off < d.data_off
           OR NEW.base_off > d.region_off + d.region_len
           OR NEW.alloc_len > d.region_off + d.region_len - NEW.base_off);
    -- Existing objects never overlap, so only the last one starting before
    -- the new extent's end can overlap it: one index probe.
    SELECT RAISE(ABORT, 'object extent overlaps another object')
    FROM (SELECT o.base_off, o.alloc_len FROM objects o
          WHERE o.device_id = NEW.device_id AND o.base_off < NEW.base_off + NEW.alloc_len
          ORDER BY o.base_off DESC LIMIT 1) p
    WHERE p.base_off + p.alloc_len > NEW.base_off;
END;

CREATE TRIGGER objects_extent_immutable
BEFORE UPDATE OF device_id, base_off, alloc_len, canonical_len ON objects
BEGIN
    SELECT RAISE(ABORT, 'object extents are immutable');
END;

CREATE TRIGGER objects_committed_immutable BEFORE UPDATE OF sha256, state ON objects
WHEN OLD.state = 'committed'
BEGIN
    SELECT RAISE(ABORT, 'committed objects are immutable');
END;

CREATE TABLE models (
    id                INTEGER PRIMARY KEY,
    name              TEXT    NOT NULL UNIQUE CHECK (length(CAST(name AS BLOB)) BETWEEN 1 AND 255),
    active_generation INTEGER CHECK (active_generation IS NULL OR active_generation > 0),
    -- Highest generation number ever handed out: numbers are never reused,
    -- even if generation rows are deleted later.
    last_generation   INTEGER NOT NULL DEFAULT 0 CHECK (last_generation >= 0),
    created_at        INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER)),
    CHECK (active_generation IS NULL OR active_generation <= last_generation),
    FOREIGN KEY (id, active_generation) REFERENCES generations (model_id, number)
) STRICT;

CREATE TABLE generations (
    id          INTEGER PRIMARY KEY,
    model_id    INTEGER NOT NULL REFERENCES models (id),
    number      INTEGER NOT NULL CHECK (number > 0),
    state       TEXT    NOT NULL DEFAULT 'importing'
                CHECK (state IN ('importing', 'ready', 'failed', 'retired')),
    source      TEXT    NOT NULL,
    total_bytes INTEGER NOT NULL DEFAULT 0 CHECK (total_bytes >= 0),
    created_at  INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER)),
    UNIQUE (model_id, number)
) STRICT;
CREATE INDEX generations_state ON generations (state);

CREATE TRIGGER generations_identity_immutable
BEFORE UPDATE OF model_id, number ON generations
BEGIN
    SELECT RAISE(ABORT, 'generation model and number are immutable');
END;

CREATE TRIGGER generations_state_transition BEFORE UPDATE OF state ON generations
WHEN NOT (OLD.state = NEW.state
          OR (OLD.state = 'importing' AND NEW.state IN ('ready', 'failed'))
          OR (OLD.state IN ('ready', 'failed') AND NEW.state = 'retired'))
BEGIN
    SELECT RAISE(ABORT, 'illegal generation state transition');
END;

CREATE TRIGGER generations_active_stays_ready BEFORE UPDATE OF state ON generations
WHEN NEW.state != 'ready'
 AND EXISTS (SELECT 1 FROM models m WHERE m.id = OLD.model_id
                                       AND m.active_generation = OLD.number)
BEGIN
    SELECT RAISE(ABORT, 'the active generation must stay ready');
END;

CREATE TRIGGER models_active_insert BEFORE INSERT ON models
WHEN NEW.active_generation IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'a new model has no generation to activate');
END;

CREATE TRIGGER models_active_must_be_ready BEFORE UPDATE OF active_generation ON models
WHEN NEW.active_generation IS NOT NULL
 AND NOT EXISTS (SELECT 1 FROM generations g
                 WHERE g.model_id = NEW.id AND g.number = NEW.active_generation
                   AND g.state = 'ready')
BEGIN
    SELECT RAISE(ABORT, 'only a ready generation of this model can be active');
END;

CREATE TABLE shards (
    id            INTEGER PRIMARY KEY,
    generation_id INTEGER NOT NULL REFERENCES generations (id) ON DELETE CASCADE,
    idx           INTEGER NOT NULL CHECK (idx >= 0),
    name          TEXT    NOT NULL CHECK (length(name) > 0),
    file_len      INTEGER NOT NULL CHECK (file_len > 8),
    header_len    INTEGER NOT NULL CHECK (header_len > 0 AND header_len <= file_len - 8),
    sha256        TEXT    NOT NULL
                  CHECK (length(sha256) = 64 AND sha256 NOT GLOB '*[^0-9a-f]*'),
    header_sha256 TEXT    NOT NULL
                  CHECK (length(header_sha256) = 64 AND header_sha256 NOT GLOB '*[^0-9a-f]*'),
    UNIQUE (generation_id, idx),
    UNIQUE (generation_id, name),
    UNIQUE (generation_id, id) -- parent key of tensors (generation_id, shard_id)
) STRICT;

CREATE TRIGGER shards_insert_importing BEFORE INSERT ON shards
WHEN NOT EXISTS (SELECT 1 FROM generations g
                 WHERE g.id = NEW.generation_id AND g.state = 'importing')
BEGIN
    SELECT RAISE(ABORT, 'shards are added only to importing generations');
END;

CREATE TABLE shard_objects (
    shard_id  INTEGER NOT NULL REFERENCES shards (id) ON DELETE CASCADE,
    object_id INTEGER NOT NULL REFERENCES objects (id),
    PRIMARY KEY (shard_id, object_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX shard_objects_object ON shard_objects (object_id);

CREATE TRIGGER shard_objects_insert_importing BEFORE INSERT ON shard_objects
WHEN NOT EXISTS (SELECT 1 FROM shards s JOIN generations g ON g.id = s.generation_id
                 WHERE s.id = NEW.shard_id AND g.state = 'importing')
BEGIN
    SELECT RAISE(ABORT, 'shards are bound only while their generation is importing');
END;

-- A tensor's shard belongs to the tensor's own generation (composite foreign
-- key). That tensors are added only while importing is checked by the C
-- layer, not by a trigger: a trigger would make every one of ~100k inserts
-- open a statement journal and double the publish time.
CREATE TABLE tensors (
    id            INTEGER PRIMARY KEY,
    generation_id INTEGER NOT NULL REFERENCES generations (id) ON DELETE CASCADE,
    shard_id      INTEGER NOT NULL,
    name          TEXT    NOT NULL CHECK (length(name) > 0),
    dtype         INTEGER NOT NULL CHECK (dtype >= 0),
    shape         TEXT    NOT NULL CHECK (json_valid(shape) AND json_type(shape) = 'array'),
    begin_off     INTEGER NOT NULL CHECK (begin_off >= 0),
    end_off       INTEGER NOT NULL CHECK (end_off >= begin_off),
    UNIQUE (generation_id, name),
    FOREIGN KEY (generation_id, shard_id) REFERENCES shards (generation_id, id)
        ON DELETE CASCADE
) STRICT;
CREATE INDEX tensors_shard ON tensors (generation_id, shard_id);

CREATE TABLE import_jobs (
    id          INTEGER PRIMARY KEY,
    model       TEXT    NOT NULL CHECK (length(CAST(model AS BLOB)) BETWEEN 1 AND 255),
    source      TEXT    NOT NULL CHECK (length(source) > 0),
    state       TEXT    NOT NULL DEFAULT 'queued'
                CHECK (state IN ('queued', 'running', 'succeeded', 'failed')),
    bytes_total INTEGER NOT NULL DEFAULT 0 CHECK (bytes_total >= 0),
    bytes_done  INTEGER NOT NULL DEFAULT 0 CHECK (bytes_done >= 0),
    error       TEXT,
    -- The generation number the job produced (or was producing), if any.
    generation  INTEGER CHECK (generation IS NULL OR generation > 0),
    created_at  INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER)),
    finished_at INTEGER,
    CHECK ((state IN ('succeeded', 'failed')) = (finished_at IS NOT NULL))
) STRICT;
CREATE INDEX import_jobs_state ON import_jobs (state);

CREATE TABLE leases (
    id            INTEGER PRIMARY KEY,
    generation_id INTEGER NOT NULL REFERENCES generations (id),
    owner         TEXT    NOT NULL CHECK (length(CAST(owner AS BLOB)) BETWEEN 1 AND 255),
    pid           INTEGER NOT NULL CHECK (pid >= 0),
    created_at    INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER))
) STRICT;
CREATE INDEX leases_generation ON leases (generation_id);
CREATE INDEX leases_owner ON leases (owner);

CREATE TABLE api_tokens (
    id         INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL CHECK (length(CAST(name AS BLOB)) BETWEEN 1 AND 255),
    sha256     TEXT    NOT NULL UNIQUE
               CHECK (length(sha256) = 64 AND sha256 NOT GLOB '*[^0-9a-f]*'),
    created_at INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER))
) STRICT;
