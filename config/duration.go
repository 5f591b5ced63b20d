package config

import (
	"errors"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/docsgate/gateway/internal/days"
)

// LongDuration is a duration that may also be written in days: 90d, 36h, 30m.
type LongDuration time.Duration

func (d *LongDuration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return errors.New("want a duration such as 90d or 36h")
	}
	v, err := days.Parse(n.Value)
	if err != nil {
		return err
	}
	*d = LongDuration(v)
	return nil
}
