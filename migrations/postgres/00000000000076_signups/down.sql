DROP TABLE signups;
