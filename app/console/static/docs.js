// The API reference at /docs: Swagger UI over this toolgate's own /openapi.json.
// A token typed into "Authorize" stays in this page's memory (persistAuthorization off),
// and nothing is fetched from anywhere but this origin (validatorUrl off).
window.ui = SwaggerUIBundle({
  url: "openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  persistAuthorization: false,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
