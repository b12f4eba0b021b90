-- The fleet catalog (logical truth of a fleet; docs/fleet.md). Applied by
-- server/fleet/catalog.c in one transaction under an advisory lock, with
-- tv_schema.version advanced in the same transaction.
CREATE TABLE nodes (
    name text PRIMARY KEY,
    url text NOT NULL DEFAULT '',
    last_seen timestamptz NOT NULL DEFAULT now(),
    state text NOT NULL DEFAULT 'up'
);

CREATE TABLE models (
    name text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE generations (
    model text NOT NULL REFERENCES models (name) ON DELETE CASCADE,
    number bigint NOT NULL CHECK (number > 0),
    state text NOT NULL,
    total_bytes bigint NOT NULL CHECK (total_bytes >= 0),
    source text NOT NULL,
    n_shards integer NOT NULL,
    n_tensors bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    published_by text NOT NULL REFERENCES nodes (name),
    PRIMARY KEY (model, number)
);

CREATE TABLE shards (
    model text NOT NULL,
    number bigint NOT NULL,
    idx integer NOT NULL CHECK (idx >= 0),
    name text NOT NULL,
    sha256 char(64) NOT NULL,
    header_sha256 char(64) NOT NULL,
    file_bytes bigint NOT NULL CHECK (file_bytes >= 0),
    header_bytes bigint NOT NULL CHECK (header_bytes >= 0),
    PRIMARY KEY (model, number, idx),
    FOREIGN KEY (model, number) REFERENCES generations (model, number) ON DELETE CASCADE
);
CREATE INDEX shards_sha256 ON shards (sha256);

CREATE TABLE tensors (
    model text NOT NULL,
    number bigint NOT NULL,
    name text NOT NULL,
    dtype text NOT NULL,
    shape int8[] NOT NULL,
    shard integer NOT NULL,
    "begin" bigint NOT NULL,
    "end" bigint NOT NULL CHECK ("end" >= "begin"),
    PRIMARY KEY (model, number, name),
    FOREIGN KEY (model, number) REFERENCES generations (model, number) ON DELETE CASCADE
);

CREATE TABLE aliases (
    model text NOT NULL REFERENCES models (name) ON DELETE CASCADE,
    alias text NOT NULL,
    generation bigint NOT NULL,
    placement text[],
    version bigint NOT NULL DEFAULT 1,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, alias),
    FOREIGN KEY (model, generation) REFERENCES generations (model, number)
);
