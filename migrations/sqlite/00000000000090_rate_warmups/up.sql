-- A rate group's warm-up schedule (`mailsplit rate warmup`): day k (a
-- "day" is `every_ms` long, counted from `since_ms`) allows
-- min(start_rate × factor^k, until_rate) × every tokens, counted across
-- every worker: `used` tokens were granted in day `period`.
CREATE TABLE rate_warmups (
    name TEXT PRIMARY KEY NOT NULL,
    start_rate DOUBLE PRECISION NOT NULL,
    factor DOUBLE PRECISION NOT NULL,
    every_ms BIGINT NOT NULL,
    until_rate DOUBLE PRECISION NOT NULL,
    since_ms BIGINT NOT NULL,
    period BIGINT NOT NULL DEFAULT 0,
    used BIGINT NOT NULL DEFAULT 0
);
