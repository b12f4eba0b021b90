-- 0002_service: what the daemon (tensorvaultd) needs: aliases, the jobs table
-- (import and verify jobs, rebuilt from import_jobs) and token scopes.
--
-- Invariants kept by the database (the C layer checks first, with precise
-- messages; these are the backstop):
--   * an alias names a generation of its own model (composite foreign key)
--     that is ready when the alias is set, and an aliased generation stays
--     ready (it cannot be retired while an alias points at it);
--   * alias names are unique per model; "active" is not an alias row (it is
--     models.active_generation);
--   * a job's finished_at is set exactly when it is succeeded, failed or
--     cancelled; started_at once it ran; bytes are non-negative;
--   * a token's scope is 'admin' or 'read'; revoked_at is set once.

CREATE TABLE aliases (
    id         INTEGER PRIMARY KEY,
    model_id   INTEGER NOT NULL REFERENCES models (id),
    name       TEXT    NOT NULL CHECK (length(name) BETWEEN 1 AND 64 AND name != 'active'),
    generation INTEGER NOT NULL CHECK (generation > 0),
    updated_at INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER)),
    UNIQUE (model_id, name),
    FOREIGN KEY (model_id, generation) REFERENCES generations (model_id, number)
) STRICT;
CREATE INDEX aliases_generation ON aliases (model_id, generation);

CREATE TRIGGER aliases_insert_ready BEFORE INSERT ON aliases
WHEN NOT EXISTS (SELECT 1 FROM generations g
                 WHERE g.model_id = NEW.model_id AND g.number = NEW.generation
                   AND g.state = 'ready')
BEGIN
    SELECT RAISE(ABORT, 'only a ready generation of this model can be aliased');
END;

CREATE TRIGGER aliases_update_ready BEFORE UPDATE OF model_id, generation ON aliases
WHEN NOT EXISTS (SELECT 1 FROM generations g
                 WHERE g.model_id = NEW.model_id AND g.number = NEW.generation
                   AND g.state = 'ready')
BEGIN
    SELECT RAISE(ABORT, 'only a ready generation of this model can be aliased');
END;

CREATE TRIGGER generations_aliased_stays_ready BEFORE UPDATE OF state ON generations
WHEN NEW.state != 'ready'
 AND EXISTS (SELECT 1 FROM aliases a WHERE a.model_id = OLD.model_id
                                      AND a.generation = OLD.number)
BEGIN
    SELECT RAISE(ABORT, 'an aliased generation must stay ready');
END;

CREATE TABLE jobs (
    id              INTEGER PRIMARY KEY,
    kind            TEXT    NOT NULL DEFAULT 'import' CHECK (kind IN ('import', 'verify')),
    state           TEXT    NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    model           TEXT    CHECK (model IS NULL OR length(CAST(model AS BLOB)) BETWEEN 1 AND 255),
    source          TEXT    CHECK (source IS NULL OR length(source) > 0),
    activate        INTEGER NOT NULL DEFAULT 0 CHECK (activate IN (0, 1)),
    alias           TEXT    CHECK (alias IS NULL OR length(alias) BETWEEN 1 AND 64),
    strict          INTEGER NOT NULL DEFAULT 0 CHECK (strict IN (0, 1)),
    device_id       INTEGER CHECK (device_id IS NULL OR device_id > 0),
    step            TEXT,
    bytes_total     INTEGER NOT NULL DEFAULT 0 CHECK (bytes_total >= 0),
    bytes_done      INTEGER NOT NULL DEFAULT 0 CHECK (bytes_done >= 0),
    rate            REAL    NOT NULL DEFAULT 0 CHECK (rate >= 0),
    error_code      TEXT,
    error_errno     INTEGER NOT NULL DEFAULT 0,
    error           TEXT,
    -- The generation number the job produced (or was producing), if any.
    generation      INTEGER CHECK (generation IS NULL OR generation > 0),
    created_at      INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER)),
    started_at      INTEGER,
    finished_at     INTEGER,
    updated_at      INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER)),
    result          TEXT    CHECK (result IS NULL OR (json_valid(result)
                                                      AND json_type(result) = 'object')),
    CHECK ((state IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CHECK (state != 'running' OR started_at IS NOT NULL),
    CHECK (kind != 'import' OR (model IS NOT NULL AND source IS NOT NULL))
) STRICT;
CREATE INDEX jobs_state ON jobs (state);

INSERT INTO jobs (id, kind, state, model, source, bytes_total, bytes_done, error_code,
                  error_errno, error, generation, created_at, started_at, finished_at,
                  updated_at)
SELECT id, 'import', state, model, source, bytes_total, bytes_done,
       CASE WHEN state = 'failed' THEN 'TV_E_INTERNAL' END,
       CASE WHEN state = 'failed' THEN -1000 ELSE 0 END,
       error, generation, created_at,
       CASE WHEN state != 'queued' THEN created_at END,
       finished_at, coalesce(finished_at, created_at)
FROM import_jobs;

DROP TABLE import_jobs;

ALTER TABLE api_tokens ADD COLUMN scope TEXT NOT NULL DEFAULT 'admin'
    CHECK (scope IN ('admin', 'read'));
ALTER TABLE api_tokens ADD COLUMN revoked_at INTEGER;
