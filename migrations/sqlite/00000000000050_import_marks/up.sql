-- Issue 25: each import of a list is one generation (lists.import_gen,
-- bumped when it starts), and every member it names is marked with it.
-- A member already marked by the running import is a duplicate row; after
-- `import --sync`, members left unmarked were not in the source and leave
-- the list (one DELETE, however long the list).
ALTER TABLE lists ADD COLUMN import_gen BIGINT NOT NULL DEFAULT 0;
ALTER TABLE list_members ADD COLUMN import_gen BIGINT;
