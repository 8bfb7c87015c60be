DROP TABLE forgotten;
