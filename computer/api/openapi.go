package api

import _ "embed"

// OpenAPI is the OpenAPI 3 document of the HTTP API (openapi.json beside
// this file), as served at /v1/openapi.json. Callers must not modify it.
//
//go:embed openapi.json
var OpenAPI []byte
