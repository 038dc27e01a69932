//go:build tools

package main

import (
	_ "github.com/jackc/pgx/v5"
	_ "github.com/jackc/puddle/v2"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/quic-go/quic-go"
	_ "github.com/xdg-go/scram"
	_ "go.uber.org/goleak"
	_ "gopkg.in/yaml.v3"
)
