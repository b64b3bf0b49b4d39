package hftokenizer

type chatConfig struct{}

func parseConfig(b []byte) (*chatConfig, error) { return &chatConfig{}, nil }
