package main

import (
	_ "github.com/go-redis/redis_rate/v10"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/redis/go-redis/v9"
	_ "go.uber.org/goleak"
	_ "go.uber.org/zap"
	_ "gopkg.in/yaml.v3"
)

func main() {}
