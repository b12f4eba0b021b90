-- 0003_generation_total_bytes: generations.total_bytes is the canonical
-- bytes of the checkpoint (every shard file, headers included: what the
-- devices hold and what the API's Generation.total_bytes and
-- ImportResult.total_bytes report). Importers before this migration stored
-- the tensor data bytes only; recompute those rows from their shards.
-- Generations without shard rows (failed before publish) keep their value.

UPDATE generations
SET total_bytes = (SELECT sum(s.file_len) FROM shards s WHERE s.generation_id = generations.id)
WHERE EXISTS (SELECT 1 FROM shards s WHERE s.generation_id = generations.id);
