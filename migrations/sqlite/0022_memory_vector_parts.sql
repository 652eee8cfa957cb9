-- The vectors' sign bits of 0018 keyed by an integer: each row of memory_vector_bits began
-- with the app, the user and the space (its key's first three columns), and a search reading a
-- user's 100,000 rows compared those three texts on every row to know where the user's rows
-- end, which cost more than reading the bits (docs/performance.md#memory-search). Now each
-- (app, user, space) with vectors has one row in memory_vector_parts and its bits are keyed by
-- that row's integer: a search finds the part, then reads (part, id, bits) in the same order.
--
-- A part lives as long as it has bits: the triggers remove it with its last vector, so a user
-- whose memories are deleted leaves no row here either. A part is added with ON CONFLICT DO
-- NOTHING, not INSERT OR IGNORE: inside a trigger SQLite gives OR IGNORE the outer statement's
-- conflict policy, and an outer OR REPLACE would then give the part a new number, away from
-- its bits.
DROP TRIGGER memory_vector_bits_ai;
DROP TRIGGER memory_vector_bits_ad;
DROP TRIGGER memory_vector_bits_au;
DROP TABLE memory_vector_bits;

CREATE TABLE memory_vector_parts (
    part     INTEGER PRIMARY KEY,
    app_name TEXT NOT NULL,
    user_id  TEXT NOT NULL,
    space    TEXT NOT NULL,
    UNIQUE (app_name, user_id, space)
);

CREATE TABLE memory_vector_bits (
    part INTEGER NOT NULL,
    id   INTEGER NOT NULL,
    bits BLOB NOT NULL,
    PRIMARY KEY (part, id)
) WITHOUT ROWID;

-- As 0018's: vectors of 128 values or more that are a multiple of 8.
CREATE TRIGGER memory_vector_bits_ai AFTER INSERT ON memory_entries
WHEN new.embedding IS NOT NULL AND new.space IS NOT NULL
     AND length(new.embedding) >= 512 AND length(new.embedding) % 32 = 0 BEGIN
    INSERT INTO memory_vector_parts (app_name, user_id, space)
    VALUES (new.app_name, new.user_id, new.space)
    ON CONFLICT (app_name, user_id, space) DO NOTHING;
    INSERT INTO memory_vector_bits (part, id, bits)
    SELECT part, new.id, vec_quantize_binary(new.embedding) FROM memory_vector_parts
     WHERE app_name = new.app_name AND user_id = new.user_id AND space = new.space;
END;

CREATE TRIGGER memory_vector_bits_ad AFTER DELETE ON memory_entries
WHEN old.embedding IS NOT NULL AND old.space IS NOT NULL BEGIN
    DELETE FROM memory_vector_bits
     WHERE part = (SELECT part FROM memory_vector_parts
                    WHERE app_name = old.app_name AND user_id = old.user_id
                      AND space = old.space)
       AND id = old.id;
    DELETE FROM memory_vector_parts
     WHERE app_name = old.app_name AND user_id = old.user_id AND space = old.space
       AND NOT EXISTS (SELECT 1 FROM memory_vector_bits b
                        WHERE b.part = memory_vector_parts.part);
END;

CREATE TRIGGER memory_vector_bits_au AFTER UPDATE OF embedding, space ON memory_entries BEGIN
    DELETE FROM memory_vector_bits
     WHERE part = (SELECT part FROM memory_vector_parts
                    WHERE app_name = old.app_name AND user_id = old.user_id
                      AND space = old.space)
       AND id = old.id;
    DELETE FROM memory_vector_parts
     WHERE app_name = old.app_name AND user_id = old.user_id AND space = old.space
       AND NOT EXISTS (SELECT 1 FROM memory_vector_bits b
                        WHERE b.part = memory_vector_parts.part);
    INSERT INTO memory_vector_parts (app_name, user_id, space)
    SELECT new.app_name, new.user_id, new.space
     WHERE new.embedding IS NOT NULL AND new.space IS NOT NULL
       AND length(new.embedding) >= 512 AND length(new.embedding) % 32 = 0
    ON CONFLICT (app_name, user_id, space) DO NOTHING;
    INSERT INTO memory_vector_bits (part, id, bits)
    SELECT part, new.id, vec_quantize_binary(new.embedding) FROM memory_vector_parts
     WHERE app_name = new.app_name AND user_id = new.user_id AND space = new.space
       AND new.embedding IS NOT NULL
       AND length(new.embedding) >= 512 AND length(new.embedding) % 32 = 0;
END;

-- The vectors stored before this migration.
INSERT INTO memory_vector_parts (app_name, user_id, space)
SELECT DISTINCT app_name, user_id, space
  FROM memory_entries
 WHERE embedding IS NOT NULL AND space IS NOT NULL
   AND length(embedding) >= 512 AND length(embedding) % 32 = 0;
INSERT INTO memory_vector_bits (part, id, bits)
SELECT p.part, m.id, vec_quantize_binary(m.embedding)
  FROM memory_entries m
  JOIN memory_vector_parts p
    ON p.app_name = m.app_name AND p.user_id = m.user_id AND p.space = m.space
 WHERE m.embedding IS NOT NULL
   AND length(m.embedding) >= 512 AND length(m.embedding) % 32 = 0;
