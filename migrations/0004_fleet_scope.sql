-- 0004_fleet_scope: a third token scope for fleet mode, 'fleet': a peer's
-- token, good only for the content-addressed blob routes (GET/HEAD
-- /v1/blobs...), which need a fleet or admin token.
--
-- SQLite cannot alter a CHECK, so api_tokens is rebuilt: the same columns in
-- the same order (ids, hashes, names, times, scopes and revocations copied
-- as they are), STRICT, sha256 UNIQUE; no index, trigger, view or foreign
-- key names the table, so there is nothing else to recreate.
--
-- Invariant kept by the database: a token's scope is 'admin', 'read' or
-- 'fleet'.

CREATE TABLE api_tokens_new (
    id         INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL CHECK (length(CAST(name AS BLOB)) BETWEEN 1 AND 255),
    sha256     TEXT    NOT NULL UNIQUE
               CHECK (length(sha256) = 64 AND sha256 NOT GLOB '*[^0-9a-f]*'),
    created_at INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER)),
    scope      TEXT    NOT NULL DEFAULT 'admin' CHECK (scope IN ('admin', 'read', 'fleet')),
    revoked_at INTEGER
) STRICT;

INSERT INTO api_tokens_new (id, name, sha256, created_at, scope, revoked_at)
SELECT id, name, sha256, created_at, scope, revoked_at FROM api_tokens;

DROP TABLE api_tokens;

ALTER TABLE api_tokens_new RENAME TO api_tokens;
