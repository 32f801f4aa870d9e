// Package badinput holds one table-driven test of every refusal dedupe
// makes: invalid keys and scopes at every entry point, invalid
// configurations, misuse of leased claims, and, per transport, bad webhook
// deliveries (methods, sizes, signatures, timestamps, event ids). Each case
// asserts the exact sentinel (errors.Is), the typed error (errors.As) or the
// HTTP status, and that nothing was written to the inbox and no handler ran.
//
// It has no non-test code; `go test ./internal/badinput` runs it.
package badinput
