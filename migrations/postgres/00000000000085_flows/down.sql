DROP TABLE flow_scheduler;
DROP TABLE flow_entries;
DROP TABLE flow_steps;
DROP TABLE flows;
