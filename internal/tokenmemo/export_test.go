package tokenmemo

// MemoMinTokens exports memoMinTokens to the door's tests.
const MemoMinTokens = memoMinTokens
