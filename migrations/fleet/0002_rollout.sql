-- Rollout state (docs/fleet.md, "Rollout"): how an alias move is switched on
-- every node (quorum, timeout), what each node holds and serves, and the
-- object store's copies of blobs.
ALTER TABLE aliases ADD COLUMN quorum integer CHECK (quorum IS NULL OR quorum > 0);
ALTER TABLE aliases ADD COLUMN timeout_s integer NOT NULL DEFAULT 600 CHECK (timeout_s > 0);

-- One row per node and generation it holds or is pulling: reported by the node.
CREATE TABLE node_generations (
    node text NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    model text NOT NULL,
    number bigint NOT NULL,
    state text NOT NULL CHECK (state IN ('pulling', 'ready', 'failed')),
    bytes_done bigint NOT NULL DEFAULT 0,
    bytes_total bigint NOT NULL DEFAULT 0,
    rate_bps double precision NOT NULL DEFAULT 0,
    error text,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node, model, number),
    FOREIGN KEY (model, number) REFERENCES generations (model, number) ON DELETE CASCADE
);
CREATE INDEX node_generations_gen ON node_generations (model, number);

-- The generation each node's local alias points at (what it serves).
CREATE TABLE node_aliases (
    node text NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    model text NOT NULL,
    alias text NOT NULL,
    generation bigint NOT NULL,
    version bigint NOT NULL,
    switched_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node, model, alias)
);

-- Blobs (shards by content) copied to the object store.
CREATE TABLE blobs (
    sha256 char(64) PRIMARY KEY,
    bytes bigint NOT NULL CHECK (bytes >= 0),
    url text NOT NULL,
    uploaded_by text NOT NULL,
    uploaded_at timestamptz NOT NULL DEFAULT now()
);
