"""Routes that are neither OpenAI nor KServe: operations, worker registration, the page, the OpenAPI document."""
