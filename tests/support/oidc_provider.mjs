// An external identity provider for the tests: the certified `oidc-provider` from npm, configured from the
// environment. It signs with the key the test hands it (OIDC_JWKS, a private JWK set), so that the test can
// also forge the bad tokens a resource server must refuse; access tokens for OIDC_RESOURCE are JWTs (RFC 9068).
import Provider from "oidc-provider";

const port = Number(process.env.OIDC_PORT);
const issuer = `http://127.0.0.1:${port}`;
const resource = process.env.OIDC_RESOURCE;
const groupsOf = (sub) => {
  const role = sub.split("-")[0];
  return ["admin", "auditor", "reader"].includes(role) ? [`switchboard-${role}s`] : ["engineers"];
};
const provider = new Provider(issuer, {
  clients: JSON.parse(process.env.OIDC_CLIENTS),
  jwks: JSON.parse(process.env.OIDC_JWKS),
  claims: { openid: ["sub"], email: ["email"], profile: ["name"], groups: ["groups"] },
  scopes: ["openid", "offline_access", "mcp"],
  // A login's first word names its groups: "admin-…", "auditor-…" and "reader-…" are in the console's.
  findAccount: (ctx, sub) => ({
    accountId: sub,
    claims: () => ({ sub, email: `${sub}@example.test`, name: `Person ${sub}`, groups: groupsOf(sub) }),
  }),
  // What an access token says of its person beside `sub` (as Keycloak, Entra and Okta can be set to).
  extraTokenClaims: (ctx, token) =>
    token.accountId ? { name: `Person ${token.accountId}`, email: `${token.accountId}@example.test` } : {},
  features: {
    clientCredentials: { enabled: true },
    registration: { enabled: true }, // open dynamic client registration, as MCP clients expect
    devInteractions: { enabled: true },
    resourceIndicators: {
      enabled: true,
      // The console's own sign-in asks for no resource: its access token is for the userinfo endpoint.
      defaultResource: (ctx, client) => (client.clientId === "console" ? undefined : resource),
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, indicator) => {
        if (indicator !== resource) throw new Error(`unknown resource ${indicator}`);
        return { scope: "mcp", audience: resource, accessTokenTTL: 300, accessTokenFormat: "jwt" };
      },
    },
  },
  pkce: { required: () => true },
});
provider.listen(port, "127.0.0.1", () => console.log(`oidc-provider listening on ${issuer}`));
