module github.com/umbp-go/umbp-go/contrib/hftokenizer

go 1.26.0

replace github.com/umbp-go/umbp-go => ../..

require (
	github.com/dlclark/regexp2 v1.12.0
	golang.org/x/text v0.44.0
)
