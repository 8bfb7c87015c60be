-- The queries of `mailsplit report` (src/store/report.rs) with EXPLAIN
-- ANALYZE, for BENCHMARKS.md. The scratch database they ran against was
-- made with `mailsplit migrate` and then:
--
--   INSERT INTO lists (name, created_at) VALUES ('l', 0);
--   INSERT INTO recipients (email, updated_at, email_key)
--     SELECT 'u' || i || '@d' || (i % 50) || '.example', 0, 'u' || i || '@d' || (i % 50) || '.example'
--     FROM generate_series(1, 1000000) i;
--   INSERT INTO campaigns (name, list_id, template, subject, from_addr, priority, state, created_at, updated_at)
--     VALUES ('c', 1, 'newsletter', 's', 'f@x.example', 100, 'queued', 0, 0);
--   INSERT INTO campaign_counters (campaign_id) VALUES (1);
--   INSERT INTO deliveries (campaign_id, recipient_id, state, attempts, last_error, updated_at)
--     SELECT 1, i, CASE WHEN i % 20 = 0 THEN 'failed' ELSE 'sent' END, 1,
--            CASE WHEN i % 20 = 0 THEN '550 5.1.1 <u' || i || '@x>: no such user' END, 1764158000000 + i * 3
--     FROM generate_series(1, 1000000) i;
--   VACUUM ANALYZE recipients; VACUUM ANALYZE deliveries;
\timing on
SELECT lower(split_part(r.email, '@', 2)) AS domain, d.state, count(*), count(d.bounced_at), count(d.complained_at),
  sum(CASE WHEN r.status = 'unsubscribed' AND r.status_reason = 'one-click unsubscribe (campaign 1)' THEN 1 ELSE 0 END)
  FROM deliveries d JOIN recipients r ON r.id = d.recipient_id WHERE d.campaign_id = 1 GROUP BY 1, 2;
EXPLAIN (ANALYZE, BUFFERS OFF) SELECT lower(split_part(r.email, '@', 2)) AS domain, d.state AS state, count(*) AS n,
  count(d.bounced_at), count(d.complained_at),
  sum(CASE WHEN r.status = 'unsubscribed' AND r.status_reason = 'one-click unsubscribe (campaign 1)' THEN 1 ELSE 0 END)
  FROM deliveries d JOIN recipients r ON r.id = d.recipient_id WHERE d.campaign_id = 1 GROUP BY 1, 2;
EXPLAIN (ANALYZE) SELECT last_error, count(*) AS n FROM deliveries WHERE campaign_id = 1 AND state = 'failed' GROUP BY last_error ORDER BY n DESC LIMIT 500;
EXPLAIN (ANALYZE) SELECT updated_at / 60000 AS minute, state, count(*) AS n FROM deliveries WHERE campaign_id = 1 AND state IN ('sent', 'failed') GROUP BY 1, 2 ORDER BY 1;
EXPLAIN (ANALYZE) SELECT status, reason, count(*) AS n FROM bounces WHERE campaign_id = 1 AND source <> 'smtp' AND kind IN ('hard','soft','policy') GROUP BY status, reason ORDER BY n DESC LIMIT 500;
