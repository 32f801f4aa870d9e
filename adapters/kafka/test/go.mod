module github.com/exactlyonce/dedupe/adapters/kafka/test

go 1.26.0

replace github.com/exactlyonce/dedupe => ../../..

replace github.com/exactlyonce/dedupe/adapters/kafka => ..

replace github.com/exactlyonce/dedupe/internal/kafkatest => ../../../internal/kafkatest

require (
	github.com/exactlyonce/dedupe v0.0.0-00010101000000-000000000000
	github.com/exactlyonce/dedupe/adapters/kafka v0.0.0-00010101000000-000000000000
	github.com/exactlyonce/dedupe/internal/kafkatest v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.13.0
	github.com/segmentio/kafka-go v0.4.51
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	github.com/twmb/franz-go/pkg/kmsg v1.15.1
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)
