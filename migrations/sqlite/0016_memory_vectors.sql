-- Memory vectors (src/store/memory/vectors.rs): each memory's embedding beside its text, as
-- float32 blobs that sqlite-vec's vec_distance_cosine compares. A memory without a vector
-- (embedding NULL) is pending: the embedder claims it until claimed_until (unix seconds),
-- embeds it and stores the vector with the space (embedding model and size) it belongs to.
ALTER TABLE memory_entries ADD COLUMN embedding BLOB;
ALTER TABLE memory_entries ADD COLUMN space TEXT;
ALTER TABLE memory_entries ADD COLUMN claimed_until REAL;

-- The pending memories of an app, for the embedder's claim.
CREATE INDEX memory_entries_pending ON memory_entries (app_name, claimed_until)
    WHERE embedding IS NULL;

-- Each app's current space: a change makes the app's memories pending again.
CREATE TABLE memory_spaces (
    app_name TEXT PRIMARY KEY,
    space    TEXT NOT NULL
) WITHOUT ROWID;
