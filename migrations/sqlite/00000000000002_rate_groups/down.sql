DROP TABLE rate_groups;
