DROP TABLE rate_usage;
