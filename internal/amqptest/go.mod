module github.com/exactlyonce/dedupe/internal/amqptest

go 1.26.0

require github.com/rabbitmq/amqp091-go v1.17.0
