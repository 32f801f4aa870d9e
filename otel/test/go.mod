module github.com/exactlyonce/dedupe/otel/test

go 1.26.0

replace github.com/exactlyonce/dedupe => ../..

replace github.com/exactlyonce/dedupe/otel => ..

replace github.com/exactlyonce/dedupe/adapters/nats => ../../adapters/nats

replace github.com/exactlyonce/dedupe/adapters/kafka => ../../adapters/kafka

replace github.com/exactlyonce/dedupe/internal/natstest => ../../internal/natstest

replace github.com/exactlyonce/dedupe/adapters/rabbitmq => ../../adapters/rabbitmq

replace github.com/exactlyonce/dedupe/internal/amqptest => ../../internal/amqptest

replace github.com/exactlyonce/dedupe/internal/kafkatest => ../../internal/kafkatest

require (
	github.com/exactlyonce/dedupe v0.0.0-00010101000000-000000000000
	github.com/exactlyonce/dedupe/adapters/kafka v0.0.0-00010101000000-000000000000
	github.com/exactlyonce/dedupe/adapters/nats v0.0.0-00010101000000-000000000000
	github.com/exactlyonce/dedupe/adapters/rabbitmq v0.0.0-00010101000000-000000000000
	github.com/exactlyonce/dedupe/adapters/redis v0.0.0-00010101000000-000000000000
	github.com/exactlyonce/dedupe/internal/amqptest v0.0.0-00010101000000-000000000000
	github.com/exactlyonce/dedupe/internal/kafkatest v0.0.0-00010101000000-000000000000
	github.com/exactlyonce/dedupe/internal/natstest v0.0.0-00010101000000-000000000000
	github.com/exactlyonce/dedupe/internal/redistest v0.0.0-00010101000000-000000000000
	github.com/exactlyonce/dedupe/otel v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.13.0
	github.com/nats-io/nats.go v1.56.0
	github.com/nats-io/nuid v1.0.1
	github.com/rabbitmq/amqp091-go v1.17.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/segmentio/kafka-go v0.4.51
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/sdk v1.47.0
	go.opentelemetry.io/otel/trace v1.47.0
)

require (
	github.com/antithesishq/antithesis-sdk-go v0.9.0-default-no-op // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/go-tpm v0.9.8 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/minio/highwayhash v1.0.4 // indirect
	github.com/nats-io/jwt/v2 v2.8.3 // indirect
	github.com/nats-io/nats-server/v2 v2.15.3 // indirect
	github.com/nats-io/nkeys v0.4.17 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/twmb/franz-go v1.22.3 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/sdk/metric v1.47.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	golang.org/x/time v0.16.0 // indirect
)

replace github.com/exactlyonce/dedupe/adapters/redis => ../../adapters/redis

replace github.com/exactlyonce/dedupe/internal/redistest => ../../internal/redistest
