//go:build tools

// Package tools pins kwok, which manages fake nodes and the pods bound to them
// for the tiers whose pods never run; its stage YAMLs come from the same
// module version.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
