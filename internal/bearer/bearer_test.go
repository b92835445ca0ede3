package bearer

import "testing"

func TestAllows(t *testing.T) {
	for _, tc := range []struct {
		name, token, header string
		want                bool
	}{
		{"none required, none sent", "", "", true},
		{"none required, any sent", "", "Bearer x", true},
		{"right token", "s3cret", "Bearer s3cret", true},
		{"Header's form", "s3cret", Header("s3cret"), true},
		{"wrong token", "s3cret", "Bearer s3cre", false},
		{"longer token", "s3cret", "Bearer s3crets", false},
		{"no scheme", "s3cret", "s3cret", false},
		{"other scheme", "s3cret", "Basic s3cret", false},
		{"scheme case", "s3cret", "bearer s3cret", false},
		{"nothing sent", "s3cret", "", false},
		{"empty token sent", "s3cret", "Bearer ", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := New(tc.token)
			if got := tok.Allows([]byte(tc.header)); got != tc.want {
				t.Errorf("Allows(%q) with token %q = %v, want %v", tc.header, tc.token, got, tc.want)
			}
			if tok.Required() != (tc.token != "") {
				t.Errorf("Required() = %v", tok.Required())
			}
		})
	}
}
