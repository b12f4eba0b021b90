-- The sidecar files of a generation (docs/fleet.md, "Sidecar files"): its
-- small non-weight files (config.json, the tokenizer's, a model card ...)
-- by path, with their length and SHA-256, recorded when the generation is
-- published; a pull fetches each from the files route of a peer that
-- holds the generation ready, and checks it against sha256.
CREATE TABLE generation_files (
    model text NOT NULL,
    number bigint NOT NULL,
    path text NOT NULL CHECK (length(path) BETWEEN 1 AND 512),
    len bigint NOT NULL CHECK (len >= 0),
    sha256 char(64) NOT NULL,
    PRIMARY KEY (model, number, path),
    FOREIGN KEY (model, number) REFERENCES generations (model, number) ON DELETE CASCADE
);
