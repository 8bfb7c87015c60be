ALTER TABLE list_members DROP COLUMN import_gen;
ALTER TABLE lists DROP COLUMN import_gen;
