package main

import "github.com/tetherdev/tether/custodian/internal/testagent"

func testAgentMain() { testagent.Main() }
