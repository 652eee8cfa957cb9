-- Memory search by meaning for a user with many memories (src/store/sqlite/memory_vectors.rs):
-- each vector's signs as bits (sqlite-vec's vec_quantize_binary, a 32nd of the vector), in a
-- narrow table clustered by user and space. A search ranks the user's bits by Hamming distance
-- and measures only the nearest few hundred exactly, instead of every vector of the user.
--
-- Only vectors of 128 values or more that are a multiple of 8 (512 bytes, a multiple of 32):
-- signs say little about a shorter vector, and those spaces are scanned exactly.
-- The triggers keep the table in step with memory_entries.embedding, so every write does
-- (the embedder storing a vector, an update or a space change clearing it, deletes, trims,
-- expiry, prunes).
CREATE TABLE memory_vector_bits (
    app_name TEXT NOT NULL,
    user_id  TEXT NOT NULL,
    space    TEXT NOT NULL,
    id       INTEGER NOT NULL,
    bits     BLOB NOT NULL,
    PRIMARY KEY (app_name, user_id, space, id)
) WITHOUT ROWID;

CREATE TRIGGER memory_vector_bits_ai AFTER INSERT ON memory_entries
WHEN new.embedding IS NOT NULL AND new.space IS NOT NULL
     AND length(new.embedding) >= 512 AND length(new.embedding) % 32 = 0 BEGIN
    INSERT INTO memory_vector_bits (app_name, user_id, space, id, bits)
    VALUES (new.app_name, new.user_id, new.space, new.id, vec_quantize_binary(new.embedding));
END;

CREATE TRIGGER memory_vector_bits_ad AFTER DELETE ON memory_entries
WHEN old.embedding IS NOT NULL AND old.space IS NOT NULL BEGIN
    DELETE FROM memory_vector_bits
     WHERE app_name = old.app_name AND user_id = old.user_id AND space = old.space
       AND id = old.id;
END;

CREATE TRIGGER memory_vector_bits_au AFTER UPDATE OF embedding, space ON memory_entries BEGIN
    DELETE FROM memory_vector_bits
     WHERE app_name = old.app_name AND user_id = old.user_id AND space = old.space
       AND id = old.id;
    INSERT INTO memory_vector_bits (app_name, user_id, space, id, bits)
    SELECT new.app_name, new.user_id, new.space, new.id, vec_quantize_binary(new.embedding)
     WHERE new.embedding IS NOT NULL AND new.space IS NOT NULL
       AND length(new.embedding) >= 512 AND length(new.embedding) % 32 = 0;
END;

-- The vectors stored before this migration.
INSERT INTO memory_vector_bits (app_name, user_id, space, id, bits)
SELECT app_name, user_id, space, id, vec_quantize_binary(embedding)
  FROM memory_entries
 WHERE embedding IS NOT NULL AND space IS NOT NULL
   AND length(embedding) >= 512 AND length(embedding) % 32 = 0;
