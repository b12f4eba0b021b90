-- 0006_shard_files: which local file a shard was imported from, so that a
-- loader given that file can read it from its generation instead
-- (python/tensorvault/_files.py, GET /v1/shards): the file's identity and
-- change stamps from the fstat the importer took when it validated the
-- header (device and inode as their unsigned 64-bit values cast to signed,
-- size, mtime and ctime in nanoseconds), recorded only when the importer
-- read and hashed that very file (a local source) and its ctime was more
-- than two seconds older than the import's start (a change within the same
-- timestamp tick could otherwise go unseen). Every change to the file's
-- bytes moves its ctime, which nothing can set back, so the stamps match
-- only the unchanged file whose bytes hashed to shards.sha256.
--
-- Lookups go by size and header hash (shards_file_header), then by the
-- content hash (shards.sha256, a Hugging Face cache blob's name) or by
-- these stamps.

CREATE TABLE shard_files (
    shard_id INTEGER PRIMARY KEY REFERENCES shards (id) ON DELETE CASCADE,
    dev      INTEGER NOT NULL,
    ino      INTEGER NOT NULL,
    size     INTEGER NOT NULL CHECK (size > 8),
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL
) STRICT;

CREATE INDEX shards_file_header ON shards (header_sha256, file_len);
