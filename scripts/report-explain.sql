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
