from bench.security.runner import main

if __name__ == "__main__":
    main()
