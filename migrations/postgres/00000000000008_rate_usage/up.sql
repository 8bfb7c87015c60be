-- Domain groups match whatever the case: names are stored lowercased. Of
-- rows that differ only in case, the lowercase one (or else the first) is
-- kept.
DELETE FROM rate_groups
 WHERE name LIKE 'domain:%' AND name <> lower(name)
   AND lower(name) IN (SELECT name FROM rate_groups);
DELETE FROM rate_groups
 WHERE name LIKE 'domain:%' AND name <> lower(name)
   AND EXISTS (SELECT 1 FROM rate_groups o
                WHERE lower(o.name) = lower(rate_groups.name) AND o.name < rate_groups.name);
UPDATE rate_groups SET name = lower(name)
 WHERE name LIKE 'domain:%' AND name <> lower(name);
-- What each worker does with each rate group, written at its heartbeat:
-- tokens spent (total and per second lately), recipients parked waiting for
-- tokens, and recipients deferred into delayed jobs not due yet. Rows of a
-- worker whose seen_at stops moving are ignored by readers.
CREATE TABLE rate_usage (
    worker TEXT NOT NULL,
    name TEXT NOT NULL,
    spent BIGINT NOT NULL DEFAULT 0,
    spent_rate DOUBLE PRECISION NOT NULL DEFAULT 0,
    parked BIGINT NOT NULL DEFAULT 0,
    deferred BIGINT NOT NULL DEFAULT 0,
    seen_at BIGINT NOT NULL,
    PRIMARY KEY (worker, name)
);
