-- Kept in step with migrations/postgres, where this migration leaves room on
-- each page of `deliveries` for its rows' updates (fillfactor). SQLite has
-- no such setting: its B-tree rewrites the row in place.
SELECT 1;
