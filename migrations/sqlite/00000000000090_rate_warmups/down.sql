DROP TABLE rate_warmups;
