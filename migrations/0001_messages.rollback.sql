DROP TYPE IF EXISTS dq_message;
DROP TYPE IF EXISTS dq_delivery;
DROP TABLE IF EXISTS dq_messages;
