ALTER TABLE lists DROP COLUMN double_opt_in;
ALTER TABLE lists DROP COLUMN is_public;
ALTER TABLE lists DROP COLUMN title;
