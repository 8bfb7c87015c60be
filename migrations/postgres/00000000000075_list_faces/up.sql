-- Lists with a face (`list create --title --public --double-opt-in`,
-- `list set`): a title the subscribers' pages show, whether `/subscribe`
-- offers the list, and whether joining it there needs a confirmed mail.
-- Lists made by `import` keep the defaults: private, single opt-in.
ALTER TABLE lists ADD COLUMN title TEXT;
ALTER TABLE lists ADD COLUMN is_public BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE lists ADD COLUMN double_opt_in BOOLEAN NOT NULL DEFAULT FALSE;
